"""SpecLens backend: captures, alignment, store. Imported by the CLI and by the dashboard pages."""

__version__ = "0.1.0"
