"""The gpuscope TensorBoard plugin (entry point group `tensorboard_plugins`)."""
