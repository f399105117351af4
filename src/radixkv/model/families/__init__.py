"""The model families, one module each (a config and its layers; `registry.py` names
them), the hybrid families' shared skeleton (`hybrid`) and their recurrent and convolution
layers (`state_layers`, `deltanet`)."""
