"""The results of bench/run_all.sh (bench/results/*.json) as tables."""
