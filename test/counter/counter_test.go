package counter

import (
	"bufio"
	"net"
	"testing"
)

func TestChecker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replies []Reply
		failed  []int // requests that failed before reply i
		wantErr int   // index of the reply that must fail, -1 none
	}{
		{"counts on", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "a", Disk: 6}}, nil, -1},
		{"goes back", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 5, BootID: "a", Disk: 5}}, nil, 1},
		{"skips", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 7, BootID: "a", Disk: 7}}, nil, 1},
		{"skips one unanswered", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 7, BootID: "a", Disk: 7}}, []int{1}, -1},
		{"skips beyond unanswered", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 8, BootID: "a", Disk: 8}}, []int{1}, 1},
		{"reboots", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "b", Disk: 6}}, nil, 1},
		{"reboots, said once", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "b", Disk: 6}, {Count: 7, BootID: "b", Disk: 7}}, nil, 1},
		{"disk behind", []Reply{{Count: 5, BootID: "a", Disk: 5}, {Count: 6, BootID: "a", Disk: 5}}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Checker
			for i, r := range tc.replies {
				for _, f := range tc.failed {
					if f == i {
						c.Failed()
					}
				}
				err := c.Check(r)
				if (err != nil) != (i == tc.wantErr) {
					t.Fatalf("reply %d (%+v): %v", i, r, err)
				}
			}
		})
	}
}

func TestASkipNamesTheConnectionThatMadeTheCountTheClientDidNotSee(t *testing.T) {
	var c Checker
	if err := c.Check(Reply{Count: 5, BootID: "a", Disk: 5, From: "10.0.0.9:40000"}); err != nil {
		t.Fatal(err)
	}
	err := c.Check(Reply{Count: 7, BootID: "a", Disk: 7, From: "10.0.0.9:40002", By: "6@10.0.0.9:40000,5@10.0.0.9:40000"})
	if err == nil {
		t.Fatal("a skip passed")
	}
	want := "the count skipped: 7 after 5 with 0 unanswered requests (this reply on 10.0.0.9:40002; 5 came on 10.0.0.9:40000; the guest says the counts before were made by 6@10.0.0.9:40000,5@10.0.0.9:40000)"
	if err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
}

func TestAskOnReadsTheGuestsReplyWithAndWithoutBy(t *testing.T) {
	for _, tc := range []struct{ line, by string }{
		{"count=3 bootid=b1 disk=count=3\n", ""},
		{"count=3 bootid=b1 disk=count=3 by=2@10.0.0.9:4000,1@10.0.0.9:3998\n", "2@10.0.0.9:4000,1@10.0.0.9:3998"},
	} {
		client, guest := net.Pipe()
		go func() {
			_, _ = bufio.NewReader(guest).ReadString('\n')
			_, _ = guest.Write([]byte(tc.line))
			_ = guest.Close()
		}()
		r, err := AskOn(client)
		_ = client.Close()
		if err != nil {
			t.Fatal(err)
		}
		if r.Count != 3 || r.BootID != "b1" || r.Disk != 3 || r.By != tc.by || r.From == "" {
			t.Fatalf("%q read as %+v", tc.line, r)
		}
	}
}
