"""Provider declarations, the pydantic config models and the TOML file."""
