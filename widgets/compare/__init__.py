"""The compare view: one prompt, two to four targets, replies side by side with their timings and a diff."""
