"""Demo pieces: a fake vendor and scripts that show exactly-once effects surviving crashes."""
