"""The gpuscope TensorBoard plugin (entry point group `tensorboard_plugins`:
gpuscope.integrations.tensorboard.plugin:GpuscopePlugin)."""
