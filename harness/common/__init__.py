"""The ground floor: text and errors as every layer shows them. It imports nothing from harness.

- `errors`: HarnessError, the one exception a user is meant to read, and the closest-name hint.
- `shown`: text as data wherever it is shown or stored (terminal, rich, Markdown, UTF-8).
- `filenames`: a file name's length checked before anything is written;
- `toml`: the TOML parser of this Python (tomllib, or tomli on 3.10);
- `versions`: torch release strings as numbers (ordered, and their major.minor).
"""
