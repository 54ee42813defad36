"""What every benchmark shares: call timing, the memory read-bandwidth probe, the user-facing
error."""
