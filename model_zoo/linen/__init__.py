"""The zoo's models in Flax Linen; their NNX ports are in `model_zoo.nnx`."""
