"""The test suite (a package, so that its helper modules import as ``tests.<name>`` under plain ``pytest``)."""
