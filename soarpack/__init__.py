"""soarpack: turn MiniCPM-SALA into a SOAR submission and measure it before you upload."""

__version__ = "0.1.0"
