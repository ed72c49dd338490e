"""What every environment and every generic layer shares: the environment protocol and registry, the tool
framework, answer and call parsing, the bank-row model, the tool-server client, the LLM client, errors."""
