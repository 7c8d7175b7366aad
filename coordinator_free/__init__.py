"""coordinator-free: peer-to-peer differentially private decentralized learning."""

__version__ = "0.1.0"
