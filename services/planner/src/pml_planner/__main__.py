from pml_planner.main import main

main()
