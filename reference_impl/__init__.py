"""reference_impl: see the README and its issue; built after wire/."""
