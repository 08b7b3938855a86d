"""Model specs and search configs that ship with the project (``MODEL=<name>``)."""
