"""The gpuscope TensorBoard plugin (entry point group `tensorboard_plugins`:
gpuscope.render.tb_plugin.plugin:GpuscopePlugin)."""
