from pml_search.main import main

main()
