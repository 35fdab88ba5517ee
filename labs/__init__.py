"""Hands-on labs: small scripts that show one idea each on synthetic data with a known answer."""
