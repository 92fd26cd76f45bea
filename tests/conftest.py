pytest_plugins = ["txnguard.testing.fixtures"]
