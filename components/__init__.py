"""The tpu-serve Pulumi components: one ComponentResource per concern."""
