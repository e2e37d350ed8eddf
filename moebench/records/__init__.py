"""Records: the JSONL schema and accessors (schema.py), the one reader of every offline input (reader.py)
and what a usable record is (validate.py), provenance (provenance.py), the writer (writer.py), knob
settings (knobs.py), terminal tables and number formatting (tables.py) and plots (plots.py). Every tool
reads and writes results through here."""
