"""`python -m pml_search`."""

from pml_search.main import main

main()
