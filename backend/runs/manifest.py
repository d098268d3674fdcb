"""The typed manifest a run starts with (manifest.json, docs/SCHEMA.md): what every kind of run records about
itself, checked when the run is created (`backend.runs.lifecycle.Run.create`), so that a run with a malformed
manifest is refused at its start instead of quarantined by the catalog later. Kind-specific sections (bench
figures, an import's source, a check's verdict) are kept as they are given (`extra="allow"`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

KINDS = ("capture", "bench", "check", "load", "watch")


class ModelInfo(BaseModel):
    """The target the run used."""

    model_config = ConfigDict(extra="allow")

    path: str | None
    model_type: str | None = None
    n_layers: NonNegativeInt | None = None
    hidden_size: NonNegativeInt | None = None
    vocab_size: NonNegativeInt | None = None
    fingerprint: str | None = None


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    done: NonNegativeInt
    total: NonNegativeInt


class Manifest(BaseModel):
    """What a run records when it is created; fields added later (status, headline, bench figures, error) are
    written by the run's lifecycle."""

    model_config = ConfigDict(extra="allow")

    kind: Literal[KINDS]  # type: ignore[valid-type]
    engine: str
    engine_version: str | None = None
    model: ModelInfo
    dtype: str | None = None
    device: str | None = None
    dataset: str | None = None
    boundaries: list[str] = Field(default_factory=list)
    settings: dict = Field(default_factory=dict)
    progress: Progress

    def to_json(self) -> dict:
        """The fields as given (no defaults added), for manifest.json."""
        return self.model_dump(mode="json", exclude_unset=True)
