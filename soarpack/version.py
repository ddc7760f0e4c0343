"""soarpack's version: read by the package root, the build (pyproject.toml) and every record that names its maker."""

__version__ = "0.1.0"
