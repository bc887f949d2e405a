"""Training: the loop (`trainer`), resumable safetensors train state (`train_state`), clean stops
on signals (`stop_signals`) and the offline corpora (`corpus`: the standard library's sources;
`package_corpus`: installed distributions' sources, pinned by version)."""
