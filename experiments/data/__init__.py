"""Labelled data the shipped specs are scored on, installed offline from pinned packages."""
