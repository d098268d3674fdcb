"""The EAGLE-3 drafter: config formats (`config.py`) and the model (`model.py`)."""

from backend.drafter.config import DrafterConfig, config_from_dict, load_config
from backend.drafter.model import DraftOut, Eagle3Drafter, init_random

__all__ = ["DrafterConfig", "DraftOut", "Eagle3Drafter", "config_from_dict", "init_random", "load_config"]
