"""Reading checkpoints from disk: layout detection, config parsing, tensor access,
name mapping and validation. The public entry points are in engine/loader.py."""
