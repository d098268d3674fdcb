"""The EAGLE-3 drafter: config formats (`config.py`) and the model (`model.py`).

The model (and torch) is imported on first use, so the config, the lint and `check-drafter --lint-only` run
without torch."""

from backend.drafter.config import DrafterConfig, config_from_dict, load_config

__all__ = ["DrafterConfig", "DraftOut", "Eagle3Drafter", "config_from_dict", "init_random", "load_config"]
_MODEL = ("DraftOut", "Eagle3Drafter", "init_random")


def __getattr__(name: str):
    if name in _MODEL:
        from backend.drafter import model

        return getattr(model, name)
    raise AttributeError(f"module 'backend.drafter' has no attribute {name!r}")
