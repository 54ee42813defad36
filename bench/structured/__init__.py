"""`fp8serve bench structured`: json_schema-constrained decode against unconstrained."""
