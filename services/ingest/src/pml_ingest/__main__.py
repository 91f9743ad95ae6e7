from pml_ingest.main import main

main()
