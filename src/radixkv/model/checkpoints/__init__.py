"""Where weights come from: named tensors of a checkpoint (`weights`), GGUF to HF
conversion (`gguf_convert`, `gemma3_gguf`), and the embedded default model (`default`,
`embedded`)."""
