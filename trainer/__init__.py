"""A JAX (flax nnx, optax) Mixture-of-Experts transformer trainer with expert parallelism."""
