"""Model checkpoints for tandem: fetch (hub, or offline GGUF conversion) and tiny random-weight checkpoints.

Everything here writes plain Hugging Face checkpoint directories and never imports the engines.
Import the submodules (fetch, init, gguf_convert) directly; this package stays import-light.
"""
