"""`kubectl vramguard`: every agent's `/status`, read through the API server's pod proxy, merged into one view."""
