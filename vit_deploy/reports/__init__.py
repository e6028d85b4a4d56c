"""What check and bench both write: the report schema, saved reports read back safely, the machine, saving."""
