"""The tutorial's agent and the shell session the tutorial walks through."""
