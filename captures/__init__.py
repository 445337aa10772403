"""captures: see the README and its issue; built after wire/."""
