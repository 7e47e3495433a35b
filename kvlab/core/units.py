"""Binary byte units, one definition for every module that shows or sizes memory."""

MIB = 1 << 20
GIB = 1 << 30
