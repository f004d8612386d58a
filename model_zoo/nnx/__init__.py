"""The zoo's models ported to Flax NNX; the Linen originals are in `model_zoo.linen`."""
