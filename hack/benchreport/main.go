// Command benchreport prints what lockstep's benchmarks measured, as ratios to what was measured
// beside them in the same run.
//
//	make bench | benchreport                         the data plane's and COLO's figures against
//	                                                 their baselines (ratios.go)
//	benchreport -workloads REPORT.json [-png FILE]   make bench-workloads' table, unprotected
//	                                                 against protected, and its chart (workloads.go)
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	report := flag.String("workloads", "", "a report of make bench-workloads (JSON): print its table (Markdown)")
	png := flag.String("png", "", "with -workloads: write its chart (PNG) here too")
	flag.Parse()
	if *report == "" {
		ratios()
		return
	}
	if err := workloadsReport(*report, *png); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}
