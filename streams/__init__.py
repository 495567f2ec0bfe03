"""The signal processors: the pure rules (`rules.py`), the Faust worker that applies them live
(`worker/`), and `coevolve replay` (`replay/`: Python and SQL engines over files, topics or the archive)."""
