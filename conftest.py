pytest_plugins = ["pml_common.testing"]
