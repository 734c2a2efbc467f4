"""Handlers of the catalogue's generic kinds (shared/spec/models.md, "Kinds")."""
