from tpuserve.cli import main

main()
