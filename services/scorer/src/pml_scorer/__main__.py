from pml_scorer.main import main

main()
