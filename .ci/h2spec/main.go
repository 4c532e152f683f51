// The h2spec command gov's CI runs: a small driver of h2spec's library
// (github.com/summerwind/h2spec, MIT), built by .ci/h2spec/build.sh from the
// h2spec source the CI machine provides. It takes the upstream command's
// flags that the agent's test uses: -h HOST -p PORT [-o SECONDS] [-S] [-j FILE].
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/summerwind/h2spec"
	"github.com/summerwind/h2spec/config"
)

func main() {
	host := flag.String("h", "127.0.0.1", "target host")
	port := flag.Int("p", 0, "target port")
	timeout := flag.Int("o", 2, "time (seconds) to wait for each test")
	strict := flag.Bool("S", false, "strict mode")
	junit := flag.String("j", "", "JUnit report file")
	flag.Parse()
	if *port == 0 {
		fmt.Fprintln(os.Stderr, "h2spec: -p PORT is required")
		os.Exit(64)
	}
	c := &config.Config{
		Host:         *host,
		Port:         *port,
		Path:         "/",
		Timeout:      time.Duration(*timeout) * time.Second,
		MaxHeaderLen: 4000,
		JUnitReport:  *junit,
		Strict:       *strict,
	}
	ok, err := h2spec.Run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}
