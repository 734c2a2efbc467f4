"""The built-in model kinds of the catalogue (shared/spec/models.md, "Kinds"), one module each."""
