// Command benchreport prints what lockstep's benchmarks measured, as ratios to what was measured
// beside them in the same run.
//
//	make bench | benchreport                         the data plane's and COLO's figures against
//	                                                 their baselines (ratios.go)
//	benchreport -workloads REPORT.json [-png FILE]   make bench-workloads' table, unprotected
//	                                                 against protected, and its chart (workloads.go)
//	benchreport -across A.json,B.json...              what each run kept of each row, side by side
//	                                                 (across.go)
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	report := flag.String("workloads", "", "a report of make bench-workloads (JSON): print its table (Markdown)")
	png := flag.String("png", "", "with -workloads: write its chart (PNG) here too")
	runs := flag.String("across", "", "reports of make bench-workloads (JSON, comma-separated): print what each kept of each row")
	flag.Parse()
	var err error
	switch {
	case *runs != "":
		err = acrossReport(os.Stdout, strings.Split(*runs, ","))
	case *report != "":
		err = workloadsReport(*report, *png)
	default:
		ratios()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}
