"""The triage environment's one tool."""
