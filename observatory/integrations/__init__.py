"""Integrations: ways other tools' training runs write the observatory's event log."""
