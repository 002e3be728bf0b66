// Command benchreport prints what lockstep's benchmarks measured, as ratios to what was measured
// beside them in the same run.
//
//	make bench | benchreport                         the data plane's and COLO's figures against
//	                                                 their baselines (ratios.go)
//	benchreport -workloads REPORT.json [-png FILE]   make bench-workloads' table, unprotected
//	                                                 against protected, and its chart (workloads.go)
//	benchreport -across A.json,B.json...              what each run kept of each row, side by side
//	                                                 (across.go)
//	benchreport -colotrace QEMU.log [-from T] [-to T] why colo-compare forced the checkpoints of
//	                                                 a primary's trace (colotrace.go)
//	benchreport -pingpong PRIMARY.log,SECONDARY.log [-from T] [-to T]
//	                                                 where each exchange of a request/response load
//	                                                 with one request outstanding spent its time
//	                                                 (pingpong.go)
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	report := flag.String("workloads", "", "a report of make bench-workloads (JSON): print its table (Markdown)")
	png := flag.String("png", "", "with -workloads: write its chart (PNG) here too")
	runs := flag.String("across", "", "reports of make bench-workloads (JSON, comma-separated): print what each kept of each row")
	trace := flag.String("colotrace", "", "a primary QEMU's log with colo-compare's trace events: print why it forced checkpoints")
	pingPong := flag.String("pingpong", "", "the primary's and the secondary's QEMU logs (comma-separated), traced with virtqueue_pop, virtqueue_fill, colo_compare_tcp_info and colo_compare_main: print where each request/response exchange spent its time")
	var from, to time.Time
	flag.Func("from", "with -colotrace or -pingpong: only the events from this time on (RFC 3339)", timeFlag(&from))
	flag.Func("to", "with -colotrace or -pingpong: only the events before this time (RFC 3339)", timeFlag(&to))
	flag.Parse()
	var err error
	switch {
	case *pingPong != "":
		logs := strings.Split(*pingPong, ",")
		if len(logs) != 2 {
			err = fmt.Errorf("-pingpong wants two logs, the primary's and the secondary's, not %q", *pingPong)
			break
		}
		err = pingPongReport(os.Stdout, logs[0], logs[1], from, to)
	case *trace != "":
		err = coloTraceReport(os.Stdout, *trace, from, to)
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

func timeFlag(into *time.Time) func(string) error {
	return func(v string) (err error) {
		*into, err = time.Parse(time.RFC3339Nano, v)
		return err
	}
}
