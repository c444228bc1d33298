"""The files a run reads and writes: Orbax checkpoints (``checkpoints``), safetensors without
torch (``safetensors_format``), the metric writer (``metrics``) and the commit that made a result
(``provenance``)."""
