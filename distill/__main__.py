import sys

from eval.threads import prefer_passive_wait

if __name__ == "__main__":
    prefer_passive_wait()  # before torch loads: idle OpenMP workers sleep instead of spinning (eval.threads)
    from distill.cli import main

    sys.exit(main())
