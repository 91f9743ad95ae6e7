from pml_trainer.main import main

main()
