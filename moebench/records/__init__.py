"""Records: the JSONL schema, reader and accessors (schema.py), provenance (provenance.py), the
writer (writer.py), knob settings (knobs.py), terminal tables and number formatting (tables.py)
and plots (plots.py). Every tool reads and writes results through here."""
